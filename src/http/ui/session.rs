//! What the server state holds for the dashboard: where it is served, and
//! the secret its sessions and form tokens are signed with.

use hmac::{KeyInit, Mac};

/// Where the dashboard is served.
pub const UI_PATH: &str = "/ui";

/// The secret sessions are signed with: made at start, so a restart signs
/// everyone out.
pub struct SessionKey([u8; 32]);

impl Default for SessionKey {
    fn default() -> Self {
        SessionKey(rand::random())
    }
}

impl SessionKey {
    pub(super) fn sign(&self, text: &str) -> String {
        use base64::Engine;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.0).expect("any key length");
        mac.update(text.as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }
}
