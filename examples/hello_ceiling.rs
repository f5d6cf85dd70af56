//! The throughput ceiling for `svc bench`: a hyper server on the same runtime
//! setup as svc that reads each request body and answers 201 with a small
//! JSON body, doing no other work. `svc bench --workload ping` against it
//! gives the requests/s that svc's figures are quoted against.
//!
//! Run with `cargo run --release --example hello_ceiling -- 127.0.0.1:8090`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

async fn answer(request: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let _body = request.into_body().collect().await?.to_bytes();
    let mut response = Response::new(Full::new(Bytes::from_static(br#"{"job":{"id":"hello","state":"available"}}"#)));
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert("content-type", "application/svc+json".parse().expect("valid header"));
    Ok(response)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let address = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:8090".to_string());
    let listener = TcpListener::bind(&address).await?;
    eprintln!("hello ceiling listening on {}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(answer)).await;
        });
    }
}
