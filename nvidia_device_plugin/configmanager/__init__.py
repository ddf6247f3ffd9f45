"""config-manager: points the plugin config at the file a node label names."""
