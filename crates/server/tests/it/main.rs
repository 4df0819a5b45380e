//! The server's integration tests, one binary: the HTTP layer (`http`), request bodies mutated
//! from valid seeds (`request_fuzz`), and speculation through the server (`speculate`).

mod http;
mod request_fuzz;
mod speculate;
