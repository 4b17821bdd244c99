"""`aiayn serve`: a translation server (FastAPI on uvicorn) with continuous batching and a web page.

- `settings.ServeSettings`: limits and batching settings; `schema`: request parsing and checks;
- `model.ServedModel`: the model behind `aiayn translate`'s own `Translator`;
- `batcher.Batcher`: hands concurrent requests to the decoding engines (one per search setting,
  `aiayn.decoding.engine.SearchEngine`) on a model worker thread;
- `metrics.Metrics`: Prometheus counters; `app.create_app`: the HTTP API and the page (`page.html`).
"""
