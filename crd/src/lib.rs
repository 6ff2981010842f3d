//! NodeIPAMConfig API types and pure validation. Nothing here talks to the API server.
