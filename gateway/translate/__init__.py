"""Translation between the APIs Meridian speaks, one module per direction, pure.

- anthropic_to_openai: Anthropic Messages → OpenAI chat (the /v1/messages front door's requests;
  an Anthropic upstream's answers and finish reasons);
- openai_to_anthropic: OpenAI chat → Anthropic Messages (requests to an Anthropic upstream; the
  /v1/messages front door's answers and event stream).

Both the front doors (gateway/api) and the provider adapters (gateway/upstreams/providers) use
them; the mapping table is in gateway/upstreams/providers/README.md.
"""
