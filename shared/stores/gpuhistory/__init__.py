"""The GPU history: each GPU's figures over time, for the monitor's charts and the GPU-hours used. `base` is the interface; `sqlite` the embedded store, `mongo` the one at scale."""
