"""The bridge: exporters -> node-metrics, tracing spans and workload events -> task-completions.

Scraping (:mod:`.scraper`) reads Prometheus text expositions (:mod:`.exposition`), maps each exporter's
metrics onto canonical names (:mod:`.mapping`, ``mapping.yaml``, evaluated by :mod:`.canonical`), turns
counters into rates (:mod:`.rates`), withholds what an exporter in trouble reports (:mod:`.health`) and
assembles one message per node scrape (:mod:`.snapshot`). Spans become completions through :mod:`.jaeger`
and :mod:`.otlp` (conventions in :mod:`.spans`); :mod:`.producer` sends everything through the topic
contracts. docs/bridge.md has the whole picture.
"""
