"""python -m course_tools.book: `make book`."""
import sys

from . import main

sys.exit(main())
