//! S3 (and S3-compatible: MinIO, s3s) stores, configured explicitly or from the standard `AWS_*` environment.

use object_store::aws::{AmazonS3, AmazonS3Builder};

/// Connection settings for one bucket. Secrets are never printed: `Debug` hides them.
#[derive(Clone, Default)]
pub struct S3Config {
    pub bucket: String,
    /// `http(s)://host:port` of an S3-compatible server; AWS itself when `None`.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id.as_ref().map(|_| "<set>"))
            .field("secret_access_key", &self.secret_access_key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl S3Config {
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`/`AWS_DEFAULT_REGION`, and `AWS_ENDPOINT_URL`
    /// (or `AWS_ENDPOINT`) for S3-compatible servers.
    pub fn from_env(bucket: &str) -> S3Config {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        S3Config {
            bucket: bucket.to_string(),
            endpoint: var("AWS_ENDPOINT_URL").or_else(|| var("AWS_ENDPOINT")),
            region: var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")),
            access_key_id: var("AWS_ACCESS_KEY_ID"),
            secret_access_key: var("AWS_SECRET_ACCESS_KEY"),
        }
    }

    /// A store for the bucket: path-style requests, `http://` allowed for an explicit endpoint (MinIO and local
    /// servers), region `us-east-1` unless given.
    pub fn build(&self) -> object_store::Result<AmazonS3> {
        install_crypto_provider();
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&self.bucket)
            .with_region(self.region.as_deref().unwrap_or("us-east-1"));
        if let Some(e) = &self.endpoint {
            b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
        }
        if let (Some(k), Some(s)) = (&self.access_key_id, &self.secret_access_key) {
            b = b.with_access_key_id(k).with_secret_access_key(s);
        }
        if let Ok(token) = std::env::var("AWS_SESSION_TOKEN") {
            b = b.with_token(token);
        }
        b.build()
    }
}

pub fn store_from_env(bucket: &str) -> object_store::Result<AmazonS3> {
    S3Config::from_env(bucket).build()
}

/// rustls needs one process-wide crypto provider; we build with `ring` (no C toolchain beyond cc, no aws-lc).
pub fn install_crypto_provider() {
    // An Err means one is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
