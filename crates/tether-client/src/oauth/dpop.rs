//! Demonstrating proof of possession (RFC 9449): an ES256 key the client holds, and a fresh
//! proof JWT signed with it for each request to the token endpoint and to the resource, so that
//! a token stolen in transit is of no use without the key.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use serde_json::{Value, json};
use tether_core::lineage::base64url;

use super::AuthError;

/// The one algorithm tether's proofs use.
pub(crate) const ALGORITHM: &str = "ES256";

/// The client's proof key, and the nonces the servers asked proofs to carry.
pub(crate) struct Dpop {
    pair: EcdsaKeyPair,
    rng: SystemRandom,
    jwk: Value,
    /// The authorization server's nonce (RFC 9449 §8).
    pub server_nonce: Mutex<Option<String>>,
    /// The resource's nonce (RFC 9449 §9).
    pub resource_nonce: Mutex<Option<String>>,
}

impl std::fmt::Debug for Dpop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dpop").field("jwk", &self.jwk).finish_non_exhaustive()
    }
}

impl Dpop {
    /// A new P-256 key.
    pub fn generate() -> Result<Dpop, AuthError> {
        let failed = |_| AuthError::Token("no DPoP key could be made".into());
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).map_err(failed)?;
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(|_| AuthError::Token("no DPoP key could be made".into()))?;
        // Uncompressed point: 0x04, then x and y of 32 bytes each.
        let point = pair.public_key().as_ref();
        let jwk = json!({"kty": "EC", "crv": "P-256", "x": base64url(&point[1..33]), "y": base64url(&point[33..65])});
        Ok(Dpop { pair, rng, jwk, server_nonce: Mutex::new(None), resource_nonce: Mutex::new(None) })
    }

    /// A proof for one `method` request to `url` (its query and fragment left out), bound to
    /// `access_token` if one is presented, carrying `nonce` if a server asked for one.
    pub fn proof(
        &self,
        method: &str,
        url: &str,
        access_token: Option<&str>,
        nonce: Option<&str>,
    ) -> Result<String, AuthError> {
        let htu = url.split(['?', '#']).next().unwrap_or(url);
        let mut jti = [0u8; 16];
        getrandom::fill(&mut jti).map_err(|err| AuthError::Token(format!("no randomness: {err}")))?;
        let iat = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let mut claims = json!({"jti": base64url(&jti), "htm": method, "htu": htu, "iat": iat});
        if let Some(token) = access_token {
            claims["ath"] = json!(base64url(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref()));
        }
        if let Some(nonce) = nonce {
            claims["nonce"] = json!(nonce);
        }
        let header = json!({"typ": "dpop+jwt", "alg": ALGORITHM, "jwk": self.jwk});
        let mut jwt = base64url(header.to_string().as_bytes());
        jwt.push('.');
        jwt.push_str(&base64url(claims.to_string().as_bytes()));
        let signature = self
            .pair
            .sign(&self.rng, jwt.as_bytes())
            .map_err(|_| AuthError::Token("the DPoP proof could not be signed".into()))?;
        jwt.push('.');
        jwt.push_str(&base64url(signature.as_ref()));
        Ok(jwt)
    }

    /// The nonce kept in `slot`.
    pub fn nonce(slot: &Mutex<Option<String>>) -> Option<String> {
        slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Keeps `nonce` in `slot`.
    pub fn keep_nonce(slot: &Mutex<Option<String>>, nonce: &str) {
        *slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(nonce.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_names_the_request_and_the_token_and_verifies_with_its_own_key() {
        let dpop = Dpop::generate().expect("a key");
        let proof = dpop.proof("POST", "https://rs.example/mcp?x=1#f", Some("tok"), Some("n1")).expect("a proof");
        let parts: Vec<&str> = proof.split('.').collect();
        let decode = |part: &str| {
            let bytes =
                tether_core::base64::decode(part, tether_core::base64::Encoding::UrlUnpadded).expect("base64url");
            serde_json::from_slice::<Value>(&bytes).expect("json")
        };
        let (header, claims) = (decode(parts[0]), decode(parts[1]));
        assert_eq!(header["typ"], "dpop+jwt");
        assert!(header["jwk"].get("d").is_none(), "the public key only");
        assert_eq!((claims["htm"].as_str(), claims["htu"].as_str()), (Some("POST"), Some("https://rs.example/mcp")));
        assert_eq!(claims["nonce"], "n1");
        let ath = base64url(ring::digest::digest(&ring::digest::SHA256, b"tok").as_ref());
        assert_eq!(claims["ath"], ath);
        let signature =
            tether_core::base64::decode(parts[2], tether_core::base64::Encoding::UrlUnpadded).expect("base64url");
        let public = ring::signature::UnparsedPublicKey::new(
            &ring::signature::ECDSA_P256_SHA256_FIXED,
            dpop.pair.public_key().as_ref().to_vec(),
        );
        let signed = format!("{}.{}", parts[0], parts[1]);
        public.verify(signed.as_bytes(), &signature).expect("a valid signature");
        let again = dpop.proof("POST", "https://rs.example/mcp", Some("tok"), None).expect("a proof");
        assert_ne!(decode(again.split('.').nth(1).expect("claims"))["jti"], claims["jti"], "a fresh jti each time");
    }
}
