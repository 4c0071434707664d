"""`python -m seqexport.cli`: the `seqexport` command."""

import sys

from seqexport.cli import main

sys.exit(main())
