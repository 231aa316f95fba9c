from littlelm.cli import main

raise SystemExit(main())
