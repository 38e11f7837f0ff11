"""The peer servers a benchmark starts, checks and stops as processes on 127.0.0.1: the process handling they share
(`process.py`: a free port, readiness, a log, stopping with the parent), llama-server (`llama_server.py`) and
`draftwise serve` itself (`draftwise_server.py`). The load test (`stages/load_test.py`), the bench's peer engines
(`stages/peers.py`) and the design's served figure (`design/served.py`) use them."""
