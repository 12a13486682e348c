"""`python -m chat.demo_upstream --port N`: the demo model on its own."""

from chat.demo_upstream.server import main

main()
