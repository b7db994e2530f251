"""Small command-line front ends, one module per rule kind; each only parses arguments and calls the library."""
