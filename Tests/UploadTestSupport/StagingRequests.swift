import UploadProtocol
import UploadRelay

extension StagingRequest {
    /// A one-stream staging named `name`, cut to `offset`, for `account`'s `key`: what a store test that cares only for
    /// the staging's bytes opens (a store that ties staging to its object, S3's, needs the account and the key).
    public static func named(
        _ name: String, offset: Int64 = 0, expectedSize: Int64? = nil, account: String = "a1", key: String = "staged.bin"
    ) throws -> StagingRequest {
        StagingRequest(
            name: name, account: account, key: try ObjectKey(validating: key), expectedSize: expectedSize,
            layout: .sequential(offset: offset, parts: [])
        )
    }
}
