import Foundation

/// A multipart upload the relays sharing a catalog began (or were about to begin) in the bucket: recorded before the
/// store holds it, so that cleanup aborts only uploads of theirs, never another writer's in a shared bucket.
public struct MultipartIntent: Hashable, Sendable {
    /// The ledger's own number for it.
    public var id: Int64
    /// The account and key the upload is for.
    public var account: String
    public var key: String
    /// The upload's key in the bucket (prefix, account and key).
    public var objectKey: String
    /// The store's upload id, once CreateMultipartUpload answered; nil when the relay stopped before it heard.
    public var uploadID: String?
    /// When it was recorded, just before the upload began.
    public var createdAt: Date

    public init(id: Int64, account: String, key: String, objectKey: String, uploadID: String?, createdAt: Date) {
        self.id = id
        self.account = account
        self.key = key
        self.objectKey = objectKey
        self.uploadID = uploadID
        self.createdAt = createdAt
    }
}

/// Where the relays record the multipart uploads they begin (``MultipartIntent``), before they begin them. Both catalogs
/// keep one; the S3 store writes it and its cleanup reads it.
public protocol MultipartLedger: Sendable {
    /// Records that `account` is about to begin a multipart upload of `key` at `objectKey` in the bucket; its id.
    func recordMultipartIntent(account: String, key: String, objectKey: String) async throws -> Int64
    /// The store began it: its upload id.
    func recordMultipartUpload(intent: Int64, uploadID: String) async throws
    /// Every intent recorded, oldest first.
    func multipartIntents() async throws -> [MultipartIntent]
    /// Forgets an intent: its upload completed, was aborted, or never began.
    func forgetMultipartIntent(id: Int64) async throws
}
