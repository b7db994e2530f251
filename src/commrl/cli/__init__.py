"""Small command-line front ends, one module per rule kind: each parses arguments and calls the library."""
