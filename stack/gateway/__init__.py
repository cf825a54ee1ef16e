"""The metering gateway in front of vllm-router: who sent each request, and what it cost in tokens and time."""
