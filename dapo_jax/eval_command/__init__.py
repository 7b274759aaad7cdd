"""`dapo-jax eval`, beside the CLI: which model and checkpoint (`run`), which data sets and the rewards
that judge them (`sets`), the table, results JSON and samples (`report`). It wires the training stack
(configs, the sampler, the run's evaluation key); the metrics themselves are `dapo_jax.evaluation`'s."""
