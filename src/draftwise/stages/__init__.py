"""Pipeline stages. Each is `run(config, out) -> run folder` with config.json and raw records.jsonl."""
