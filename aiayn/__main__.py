import sys

from aiayn.cli import main

if __name__ == "__main__":  # not when a worker process started by "spawn" imports this module
    sys.exit(main())
