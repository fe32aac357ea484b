#!/usr/bin/env python
"""Django's command-line utility for Fairgate (from a checkout; installed, the same is `fairgate`)."""

from config.main import main

if __name__ == "__main__":
    main()
