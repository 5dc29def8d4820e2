//! Configuration as the AWS CLI finds it, through the SDK's own loader (`aws-config`):
//! where the environment names no keys, credentials come from the CLI's chain
//! (`AWS_PROFILE`, `~/.aws/credentials`, `~/.aws/config` with `credential_process`,
//! assumed roles and web identity, the container's or the instance's role), and the
//! region and endpoint from the profile (`region`, `endpoint_url`) where no `AWS_*`
//! variable gives them. object_store itself reads only the variables.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::meta::region::RegionProviderChain;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use object_store::CredentialProvider;
use object_store::aws::AwsCredential;

/// What the profile adds to the environment.
pub(super) struct Profile {
    pub(super) region: Option<String>,
    pub(super) endpoint: Option<String>,
    pub(super) credentials: Option<Arc<SdkCredentials>>,
}

/// Whether the environment names the keys itself (then object_store reads them).
fn keys_in_environment() -> bool {
    std::env::var_os("AWS_ACCESS_KEY_ID").is_some()
}

/// The profile's region, endpoint and credentials for what the environment lacks. Reads
/// files only; credentials are fetched (a process run, a role assumed) at the first
/// request, and again before they expire.
pub(super) async fn load() -> Profile {
    let region = if std::env::var_os("AWS_REGION").is_none()
        && std::env::var_os("AWS_DEFAULT_REGION").is_none()
    {
        // The profile's alone: the SDK's default chain would ask the instance metadata
        // service off EC2 too, a second or more at every mount.
        RegionProviderChain::first_try(aws_config::profile::ProfileFileRegionProvider::new())
            .region()
            .await
            .map(|r| r.to_string())
    } else {
        None
    };
    let endpoint = if ["AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3"]
        .iter()
        .all(|v| std::env::var_os(v).is_none())
    {
        let conf = aws_config::provider_config::ProviderConfig::without_region();
        aws_config::default_provider::endpoint_url::endpoint_url_provider(&conf).await
    } else {
        None
    };
    let credentials = if keys_in_environment() {
        None
    } else {
        let chain = aws_config::default_provider::credentials::DefaultCredentialsChain::builder()
            .build()
            .await;
        Some(Arc::new(SdkCredentials {
            chain: SharedCredentialsProvider::new(chain),
            held: tokio::sync::Mutex::new(None),
        }))
    };
    Profile {
        region,
        endpoint,
        credentials,
    }
}

/// The SDK's credentials chain as object_store's credential provider: asked once, and
/// again 5 minutes before what it gave expires.
#[derive(Debug)]
pub(super) struct SdkCredentials {
    chain: SharedCredentialsProvider,
    held: tokio::sync::Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

/// Credentials are fetched again this long before they expire.
const EXPIRY_MARGIN: Duration = Duration::from_secs(300);

/// The chain found no credentials: said with where it looked.
#[derive(Debug, thiserror::Error)]
#[error(
    "no credentials: none in the environment (AWS_ACCESS_KEY_ID), the profile \
     (AWS_PROFILE, ~/.aws/credentials, ~/.aws/config), web identity, the container or the \
     instance metadata service: {0}"
)]
struct NoCredentials(String);

#[async_trait::async_trait]
impl CredentialProvider for SdkCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut held = self.held.lock().await;
        if let Some((c, expiry)) = held.as_ref()
            && expiry.is_none_or(|e| e > SystemTime::now() + EXPIRY_MARGIN)
        {
            return Ok(c.clone());
        }
        let got = self.chain.provide_credentials().await.map_err(|e| {
            object_store::Error::Unauthenticated {
                path: String::new(),
                source: Box::new(NoCredentials(in_one_line(&e))),
            }
        })?;
        let c = Arc::new(AwsCredential {
            key_id: got.access_key_id().to_string(),
            secret_key: got.secret_access_key().to_string(),
            token: got.session_token().map(str::to_string),
        });
        *held = Some((c.clone(), got.expiry()));
        Ok(c)
    }
}

/// The error and its causes, in one line.
fn in_one_line(e: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(e), |c| c.source())
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(": ")
}
