import sys

from delegate.cli import main

sys.exit(main())
