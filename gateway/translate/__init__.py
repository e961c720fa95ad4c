"""Translation between the APIs Meridian speaks, pure, one module per direction and job:

- anthropic_to_openai: Messages requests → chat requests (the /v1/messages front door);
- anthropic_to_openai_answers: Messages answers → chat answers (an Anthropic upstream's, for the
  Anthropic adapter; its stream is gateway/upstreams/providers/anthropic_stream.py);
- openai_to_anthropic: chat requests → Messages requests (requests to an Anthropic upstream);
- openai_to_anthropic_answers: chat answers and chunks → Messages message and event stream (the
  /v1/messages front door's answers).

Both the front doors (gateway/api) and the provider adapters (gateway/upstreams/providers) use
them; the mapping table is in gateway/upstreams/providers/README.md.
"""
