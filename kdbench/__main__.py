import sys

from kdbench.cli import main

sys.exit(main())
