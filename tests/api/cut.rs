//! A proxy in front of a fake server that loses chosen answers: the request reaches the server
//! and takes effect there, and the client sees its connection close before any answer, as
//! when a forge restarts mid-request. One request per connection (it asks for `close`).

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone)]
pub struct CutProxy {
    pub url: String,
    state: Arc<Mutex<Cuts>>,
}

#[derive(Default)]
struct Cuts {
    /// (method, a part of the path, how many more answers to lose).
    planned: Vec<(String, String, u32)>,
    lost: u32,
}

impl CutProxy {
    /// Needs a Tokio runtime (it spawns its accept loop).
    pub fn start(upstream: &str) -> Self {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let listener = TcpListener::from_std(listener).expect("a Tokio listener");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let proxy = Self {
            url,
            state: Arc::default(),
        };
        let this = proxy.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let this = this.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move { this.serve(client, &upstream).await });
            }
        });
        proxy
    }

    /// The next `times` answers to `method` requests whose path contains `path` are lost.
    pub fn lose_answers(&self, method: &str, path: &str, times: u32) {
        let mut s = self.state.lock().expect("lock");
        s.planned.push((method.to_owned(), path.to_owned(), times));
    }

    /// How many answers were lost so far.
    pub fn lost(&self) -> u32 {
        self.state.lock().expect("lock").lost
    }

    fn take_cut(&self, method: &str, path: &str) -> bool {
        let mut s = self.state.lock().expect("lock");
        let cut = s
            .planned
            .iter_mut()
            .find(|(m, p, n)| *n > 0 && m == method && path.contains(p.as_str()));
        match cut {
            Some(c) => {
                c.2 -= 1;
                s.lost += 1;
                true
            }
            None => false,
        }
    }

    async fn serve(&self, client: TcpStream, upstream: &str) -> Option<()> {
        let mut client = BufReader::new(client);
        let mut head = Vec::new();
        let mut line = String::new();
        let mut length = 0usize;
        let mut request_line = String::new();
        loop {
            line.clear();
            if client.read_line(&mut line).await.ok()? == 0 {
                return None;
            }
            if request_line.is_empty() {
                request_line = line.clone();
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().ok()?;
            }
            if line == "\r\n" {
                head.extend_from_slice(b"Connection: close\r\n\r\n");
                break;
            }
            if !lower.starts_with("connection:") {
                head.extend_from_slice(line.as_bytes());
            }
        }
        let mut body = vec![0; length];
        client.read_exact(&mut body).await.ok()?;
        let mut parts = request_line.split_whitespace();
        let (method, path) = (parts.next()?.to_owned(), parts.next()?.to_owned());
        let mut server = TcpStream::connect(upstream).await.ok()?;
        server.write_all(&head).await.ok()?;
        server.write_all(&body).await.ok()?;
        let mut answer = Vec::new();
        server.read_to_end(&mut answer).await.ok()?;
        if self.take_cut(&method, &path) {
            // Dropped with no answer: the request took effect upstream all the same.
            return Some(());
        }
        client.get_mut().write_all(&answer).await.ok()?;
        client.get_mut().shutdown().await.ok()
    }
}
