"""`aiayn serve`: a translation server (FastAPI on uvicorn) with continuous batching and a web page.

- `settings.ServeSettings`: limits and batching settings; `schema`: request parsing and checks;
- `engine.Engine`: the model behind `aiayn translate`'s own `Translator`;
- `batcher.Batcher`: gathers concurrent requests into one beam search on a model worker thread;
- `metrics.Metrics`: Prometheus counters; `app.create_app`: the HTTP API and the page (`page.html`).
"""
