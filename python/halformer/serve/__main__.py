import sys

from halformer.serve import main

sys.exit(main())
