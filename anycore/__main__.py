import sys

from anycore.cli import main

sys.exit(main())
