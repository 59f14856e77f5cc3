"""Every decision of a call, pure (nothing launched): the options, the route, the planning,
the config per target, the portable target's autotuning."""
