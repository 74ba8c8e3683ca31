"""What llama-server instances need on the rig and on the controller: its API, argv, unit, configuration and names."""
