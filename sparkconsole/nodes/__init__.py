"""Node telemetry: transports, the agent stream, typed samples, OOM guards, alerts. Knows nothing of Textual."""
