"""The engine: request state, continuous-batching scheduler, step loop and its asyncio front."""
