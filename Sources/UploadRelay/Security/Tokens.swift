import UploadChecksums
import Foundation

/// Bearer tokens: made from 32 random bytes, shown once, stored only as their SHA-256.
public enum Tokens {
    /// A new token: `upl_` and 43 characters of base64url (32 random bytes).
    public static func generate() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let base64 = Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
        return "upl_" + base64
    }

    /// What the catalog keeps of a token. Tokens carry 256 random bits, so one SHA-256 is enough.
    public static func hash<Bytes: Sequence>(_ token: Bytes) -> [UInt8] where Bytes.Element == UInt8 {
        SHA256.hash(token)
    }
}
