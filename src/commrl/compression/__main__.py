"""``python -m commrl.compression``: the analytic bytes per tick of pair A against dense (ledger.main)."""

from commrl.compression.ledger import main

main()
