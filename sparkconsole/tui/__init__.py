"""The Textual console: draws what the layers below publish; owns no logic."""
