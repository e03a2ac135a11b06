"""What is measured: node 0's Prometheus metrics of a run (`--metrics-port`).

`state` holds the numbers (frozen, pure updates), `recorder.RunMetrics` is what the run's hooks
call, `collector` turns a state into metric families (prometheus_client), `server` serves them at
`/metrics` for the run's life and writes `LOG_DIR/metrics.prom` at its end. Torch-free; the
run package calls in, nothing here calls out.
"""
