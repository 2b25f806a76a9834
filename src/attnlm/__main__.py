from attnlm.cli import main

raise SystemExit(main())
