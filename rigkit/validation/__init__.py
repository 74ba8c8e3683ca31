"""The controller's checks before any rig is touched: variables, rules, preflight, driver compatibility."""
