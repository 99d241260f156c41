//! The earlier server's control plane, acting: prewarm hints to the kvd beside the
//! engines (`prewarm`), profiling on the engines themselves (`profile`), and pool sizes
//! on the InferaDeployment (`scale`). `request::control` reads the requests, `http::control`
//! renders the answers; these do the I/O between, with narrow handles (a client, a
//! registry snapshot), never the whole gateway.

pub(crate) mod prewarm;
pub(crate) mod profile;
pub(crate) mod scale;
