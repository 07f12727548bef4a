"""`python -m halformer.serve CONFIG`: the Triton server over halformer models (serve/triton.py)."""
import sys

from halformer.serve import main

sys.exit(main())
