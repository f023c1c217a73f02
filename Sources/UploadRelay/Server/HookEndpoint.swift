import Foundation

/// `--on-commit-url` as the relay uses it: the URL it posts to, without the user and password it may carry, which go as
/// HTTP Basic authentication; and the URL as messages and the catalog show it: scheme, host and port only (tokens travel
/// in the user information, the path and the query).
public struct HookEndpoint: Sendable {
    /// What is requested: no user information.
    let url: String
    /// `Basic base64(user:password)`, when the URL carried a user.
    let authorization: String?
    /// For logs and `commit_event.last_error`: scheme, host and port; `/…` where a path or a query was.
    let redacted: String

    /// Nil when `text` is not an http(s) URL with a host.
    init?(_ text: String) {
        guard var components = URLComponents(string: text), let scheme = components.scheme?.lowercased(), ["http", "https"].contains(scheme),
            let host = components.host, !host.isEmpty
        else { return nil }
        if let user = components.user {
            // URLComponents gives them decoded; Basic takes them as they are.
            let pair = user + ":" + (components.password ?? "")
            self.authorization = "Basic " + Data(pair.utf8).base64EncodedString()
        } else {
            self.authorization = nil
        }
        components.user = nil
        components.password = nil
        guard let plain = components.string else { return nil }
        self.url = plain
        self.redacted = Self.redact(text)
    }

    /// `text` as scheme, host and port, for messages: never a password or a token, whatever the URL.
    static func redact(_ text: String) -> String {
        // Anything but an http(s) URL with a host shows nothing of itself: `user:password@host/x` reads as a URL whose
        // scheme is the user's name.
        guard var components = URLComponents(string: text), let scheme = components.scheme?.lowercased(), ["http", "https"].contains(scheme),
            let host = components.host, !host.isEmpty
        else { return "(not an http:// or https:// URL)" }
        // The path goes too: webhooks often carry their secret there (…/services/T0/B0/XXXX).
        let hidden = !components.path.isEmpty && components.path != "/" || components.query != nil
        components.user = nil
        components.password = nil
        components.path = ""
        components.query = nil
        components.fragment = nil
        return (components.string ?? "(a URL)") + (hidden ? "/…" : "")
    }
}

extension HookEndpoint {
    /// Whether `text` is an http(s) URL with a host (`upload-relay serve --on-commit-url`).
    public static func isValid(_ text: String) -> Bool { HookEndpoint(text) != nil }

    /// `text` as messages show it: without user information or query.
    public static func redacted(_ text: String) -> String { Self.redact(text) }
}
