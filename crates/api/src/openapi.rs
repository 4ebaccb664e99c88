//! The OpenAPI 3.1 document of the API, served at `/api/openapi.json`. It is kept by hand
//! (crates/api/src/openapi.json) rather than derived from the handlers, so that it is a
//! statement the routes are checked against: the tests compare its operations with
//! [`crate::route_table`] both ways and check the answers of its `GET` routes against the
//! schemas' required properties.

/// The document.
pub const OPENAPI: &str = include_str!("openapi.json");
