"""What the fleet services front and scrape: the gateway's and the monitor's plans, fleet status, promtool."""
