//! HTTPS validating admission for NodeIPAMConfig.
