from nvidia_device_plugin.cli.main import main

raise SystemExit(main())
