import Foundation

/// `--on-commit-url` as the relay uses it: the URL it posts to, without the user and password it may carry, which go as
/// HTTP Basic authentication; and the URL as messages and the catalog show it, with neither the user information nor the
/// query (where tokens travel).
public struct HookEndpoint: Sendable {
    /// What is requested: no user information.
    let url: String
    /// `Basic base64(user:password)`, when the URL carried a user.
    let authorization: String?
    /// For logs and `commit_event.last_error`: scheme, host, port and path; `?…` where a query was.
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

    /// `text` without user information or query, for messages: never a password or a token, whatever the URL.
    static func redact(_ text: String) -> String {
        guard var components = URLComponents(string: text), components.scheme != nil else { return "(a URL that cannot be read)" }
        let hadQuery = components.query != nil
        components.user = nil
        components.password = nil
        components.query = nil
        components.fragment = nil
        return (components.string ?? "(a URL)") + (hadQuery ? "?…" : "")
    }
}

extension HookEndpoint {
    /// Whether `text` is an http(s) URL with a host (`upload-relay serve --on-commit-url`).
    public static func isValid(_ text: String) -> Bool { HookEndpoint(text) != nil }

    /// `text` as messages show it: without user information or query.
    public static func redacted(_ text: String) -> String { Self.redact(text) }
}
