"""The flight recorder: every node tick and state change kept on disk (store), fed from a ClusterMonitor
(feed), read back for replays and post-mortems (reader, postmortem). See docs/RECORDER.md."""
