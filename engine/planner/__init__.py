"""Planning the prefill:decode split: cost models fitted to the store's measured steps, a discrete-event
replay of the traffic through every split of the devices, and the ranking by goodput. Pure computation
on store data (no fleet, no torch); the fleet's `rebalance` and `autoplan` act on its answer."""
