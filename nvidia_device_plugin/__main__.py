from nvidia_device_plugin.cli import main

raise SystemExit(main())
