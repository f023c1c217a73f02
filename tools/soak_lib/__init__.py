"""Helpers of tools/soak: a seeded randomized soak test of upload-relay and upload-agent."""
