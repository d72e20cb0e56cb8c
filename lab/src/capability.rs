//! Capability tokens: the control plane signs, the target verifies.
//!
//! A capability names the deployment key, job, attempt, runner and fence it was redeemed for
//! and when it expires; the signature is an HMAC-SHA256 with a secret that only the control
//! plane and the target share. The target can therefore trust the fence it carries.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use protocol::Capability;

fn mac(secret: &[u8], capability: &Capability) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    let message = format!(
        "{}\n{}\n{}\n{}\n{}\n{}",
        capability.deployment_key,
        capability.job,
        capability.attempt,
        capability.runner,
        capability.fence,
        capability.expires_ms
    );
    mac.update(message.as_bytes());
    mac
}

/// Fills in the signature of `capability`.
pub fn sign(secret: &[u8], mut capability: Capability) -> Capability {
    capability.signature = hex::encode(mac(secret, &capability).finalize().into_bytes());
    capability
}

/// Whether the signature matches every other field (compared in constant time).
pub fn verify(secret: &[u8], capability: &Capability) -> bool {
    let Ok(signature) = hex::decode(&capability.signature) else {
        return false;
    };
    mac(secret, capability).verify_slice(&signature).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Capability {
        Capability {
            deployment_key: "prod".into(),
            job: "j1".into(),
            attempt: "j1-a1".into(),
            runner: "r1".into(),
            fence: 7,
            expires_ms: 1_000,
            signature: String::new(),
        }
    }

    #[test]
    fn signed_capability_verifies_and_any_change_breaks_it() {
        let signed = sign(b"secret", sample());
        assert!(verify(b"secret", &signed));
        assert!(!verify(b"other", &signed));
        let mut forged = signed.clone();
        forged.fence = 8;
        assert!(!verify(b"secret", &forged));
        let mut garbage = signed;
        garbage.signature = "zz".into();
        assert!(!verify(b"secret", &garbage));
    }
}
