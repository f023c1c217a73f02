/// Where a URL hook's events go (``CommitHooks/url``): one POST of the event as JSON, with the URL's user as HTTP Basic
/// authentication, answered within `timeout`.
public protocol HookPoster: Sendable {
    /// The HTTP status the URL answered (its body read and dropped), or throws why none came in time.
    func post(url: String, authorization: String?, json: [UInt8], timeout: Duration) async throws -> Int
}
