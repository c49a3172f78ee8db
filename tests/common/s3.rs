//! A moto S3 server for the tests of datasets in object storage (`python -m moto.server`,
//! installed by `scripts/setup-python.sh`), spoken to over HTTP by object_store's S3 client
//! exactly as AWS would be.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use trajstore::remote::{Remote, RemoteOptions};

/// A moto S3 server on a free local port, stopped on drop.
pub struct S3Server {
    child: Child,
    pub port: u16,
}

/// Ports of the servers this process runs: two tests starting servers at once must not be given
/// the same free port (the second server would fail to bind, and its readiness check would be
/// answered by the first, which goes away with its test).
static PORTS: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());

impl S3Server {
    pub fn start() -> Option<Self> {
        let py = super::python_with("moto.server", "the moto S3 server")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let port = {
                let mut ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
                let port = loop {
                    let p = TcpListener::bind("127.0.0.1:0")
                        .unwrap()
                        .local_addr()
                        .unwrap()
                        .port();
                    if !ports.contains(&p) {
                        break p;
                    }
                };
                ports.push(port);
                port
            };
            let child = Command::new(&py)
                .args([
                    "-m",
                    "moto.server",
                    "-H",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start moto.server");
            let mut server = S3Server { child, port };
            // Ready when the port answers while our server runs; a server that exited could not
            // bind the port (something else took it since): start another on a new one.
            loop {
                assert!(Instant::now() < deadline, "moto.server did not start");
                if server.child.try_wait().ok().flatten().is_some() {
                    break;
                }
                if server.http("GET", "/", &[]).is_ok() {
                    return Some(server);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One unsigned path-style request (moto accepts them); returns the status and body.
    pub fn http(&self, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.port,
            body.len()
        )?;
        s.write_all(body)?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        let text = String::from_utf8_lossy(&out);
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other("no HTTP status"))?;
        let body_at = out
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(out.len(), |p| p + 4);
        Ok((status, out[body_at..].to_vec()))
    }

    pub fn bucket(&self, name: &str) -> String {
        let (status, _) = self.http("PUT", &format!("/{name}"), &[]).unwrap();
        assert_eq!(status, 200, "create bucket {name}");
        format!("s3://{name}")
    }

    /// A signed client for `bucket`, to damage and inspect objects behind trajstore's back.
    pub fn store(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        let mut b = object_store::aws::AmazonS3Builder::new().with_bucket_name(bucket);
        for (k, v) in self.settings() {
            b = b.with_config(k.parse().unwrap(), v);
        }
        b.build().unwrap()
    }

    pub fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// Replaces an object's bytes.
    pub fn put_raw(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let store = self.store(bucket);
        let payload = object_store::PutPayload::from(bytes.to_vec());
        Self::block(store.put(&ObjectPath::from(key), payload)).unwrap();
    }

    pub fn get_raw(&self, bucket: &str, key: &str) -> Vec<u8> {
        let store = self.store(bucket);
        Self::block(async { store.get(&ObjectPath::from(key)).await?.bytes().await })
            .unwrap()
            .to_vec()
    }

    pub fn delete_raw(&self, bucket: &str, key: &str) {
        let store = self.store(bucket);
        Self::block(store.delete(&ObjectPath::from(key))).unwrap();
    }

    /// Object keys under `prefix` in `bucket`.
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let store = self.store(bucket);
        let prefix = ObjectPath::from(prefix);
        let metas: Vec<_> = Self::block(futures::TryStreamExt::try_collect(
            store.list(Some(&prefix)),
        ))
        .unwrap();
        let mut keys: Vec<String> = metas.into_iter().map(|m| m.location.to_string()).collect();
        keys.sort();
        keys
    }

    pub fn settings(&self) -> [(&'static str, String); 5] {
        [
            ("aws_endpoint", self.endpoint()),
            ("aws_allow_http", "true".into()),
            ("aws_access_key_id", "trajstore".into()),
            ("aws_secret_access_key", "trajstore".into()),
            ("aws_region", "us-east-1".into()),
        ]
    }

    pub fn options(&self) -> RemoteOptions {
        self.settings()
            .into_iter()
            .fold(RemoteOptions::default(), |o, (k, v)| o.with(k, v))
    }

    pub fn remote(&self, url: &str) -> Remote {
        Remote::open(url, self.options()).unwrap()
    }

    /// The trajstore binary with this server's settings in the environment.
    pub fn cli(&self, cache: &Path) -> Command {
        let mut c = super::bin();
        for (k, v) in self.settings() {
            c.env(k.to_ascii_uppercase(), v);
        }
        c.env("TRAJSTORE_CACHE", cache);
        c
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        PORTS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|&p| p != self.port);
    }
}
