"""`python -m rope_extend ...`"""

import sys

from .cli import main

sys.exit(main())
