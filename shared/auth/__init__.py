"""Who may do what: the tenants' bearer tokens, the jobs' publish tokens, dashboard sessions, and the secret keys behind them."""
